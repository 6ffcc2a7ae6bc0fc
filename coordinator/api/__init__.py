"""The Python API: `Fabric`, a stored job's handle, `map`."""
