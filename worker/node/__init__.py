"""What a node is and knows: settings, flags, GPUs and health, metrics, policy, fleet adverts."""
