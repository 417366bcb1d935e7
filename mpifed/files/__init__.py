"""Files and streams read and written safely: YAML within limits, no symbolic link followed, a closed pipe, the
packaged configs."""
