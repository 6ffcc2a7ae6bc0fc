"""Interactive calls: a `gpu` block's slice, its calls, what they print."""
