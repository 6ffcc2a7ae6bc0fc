"""Leases on a node's VRAM: the ledger, the lease service, quotas and the fair share."""
