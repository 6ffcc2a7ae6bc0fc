"""The executor process: runs chunks' work for the agent (`python -m vramfabric.worker.executor`).

It imports nothing of the agent's side (node/, leases/, chunks/, executors/); the agent
imports from here what both sides share: the pipe's frames (ipc.py), the capture of what
chunks print (captured.py) and the process hardening (hardening.py). This module imports
nothing, so that importing one of those costs the agent nothing more.
"""
