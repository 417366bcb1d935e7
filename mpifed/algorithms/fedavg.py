"""FedAvg (McMahan et al., 2017): local SGD, then the sample-weighted average of the local models."""
from mpifed.algorithms.base import Algorithm


class FedAvg(Algorithm):
    """Everything FedAvg does is the base class's default behaviour."""

    name = "fedavg"
