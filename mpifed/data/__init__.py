"""Data sets, partitions, HDF5 shards and the prepare step."""
