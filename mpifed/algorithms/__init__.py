"""The federated methods: each module here registers one or more methods with
``@ALGORITHMS.register("name")`` (:data:`mpifed.plugin.registry.ALGORITHMS`), so a new method is one
new file. :mod:`mpifed.algorithms.base` defines the interface (and is FedAvg). A method's
docstring starts with its name as papers write it (FedNTD, FedGKD+): figures and report
tables show that name."""
