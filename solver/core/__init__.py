"""The bottom layer: errors, units, files, the cost graph, the cluster, the one evaluator of f(S).

Everything else imports from here; nothing here imports another layer of mtpp."""
