"""Between processes: the collectives between ranks, and what the launcher and its ranks tell each other."""
