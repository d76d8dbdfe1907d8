"""calmkit_simulator: datasets, populations, mechanisms and experiments."""
