"""vramfabric tests: unit, integration (real nats-server), chaos and gpu."""
