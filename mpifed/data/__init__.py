"""Data sets, partitions, HDF5 shards, a prepared folder on disk and the client data in memory."""
