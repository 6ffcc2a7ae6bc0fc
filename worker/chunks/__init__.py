"""A leased job's chunks on this node: pulled, run on their lease's slot, stored and acked."""
