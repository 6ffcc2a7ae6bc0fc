"""Leases: the lease pool, where to ask for leases, the fleet's adverts."""
