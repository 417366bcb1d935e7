"""FedAvg (McMahan et al., 2017): local SGD, then the sample-weighted average of the local models."""
from mpifed.algorithms.base import Algorithm
from mpifed.plugin.registry import ALGORITHMS


@ALGORITHMS.register("fedavg")
class FedAvg(Algorithm):
    """FedAvg (McMahan et al., AISTATS 2017): local SGD on cross-entropy, then the sample-weighted
    average of the local models (the interface's default behaviour, :mod:`mpifed.algorithms.base`)."""

    asynchronous = "its client needs only the model it starts from"
