"""Back ends: what a plan becomes after planning (simulation, exported models, verification,
runs)."""
