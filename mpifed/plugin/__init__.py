"""What a plug-in declares itself with: its options and the registry it registers in. Imports nothing of mpifed."""
