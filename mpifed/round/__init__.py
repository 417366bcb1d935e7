"""Start-up and the round: the phases every rank walks, the protocol of a round, the server's and the worker's side."""
