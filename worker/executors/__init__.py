"""The agent's side of its executor processes: the pool, each process's handle, their start."""
