"""Chaos tests: kill workers, servers and coordinators mid-job."""
