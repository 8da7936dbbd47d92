"""Back ends: what a plan becomes after planning (simulation, exported models, verification,
runs).

The one entry per command for the three plan kinds (``"pipeline"``, ``"spmd"``, ``"joint"``)
is :mod:`solver.backends.dispatch` (``evaluate``, ``simulate``, ``export``, each a table
``{kind: function}``). This file imports nothing: every import of a back end module runs it,
a spawned stage process of ``mtpp run`` included."""
