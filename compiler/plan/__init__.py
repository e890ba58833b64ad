"""Planners: each takes the layer graph, the cost table, an objective and options, and returns plans,
best first (planner.py: `(graph, cost, objective, options) -> list[Plan]`); none touches ONNX.

- pipeline.py: the exact pipeline planner and its problem (the chain of blocks between pipeline cuts priced per
  device); pipeline_pareto.py: its Pareto DP for the shared medium; baselines.py: single, even, neurosurgeon.
- spatial.py, spatial_search.py: the ADaPS-style spatial and hybrid searches (lanes.py runs them side
  by side); spatial_partitions.py: the search's partition search of one transition (tile sizes per device);
  spatial_baselines.py: BBGraP, EdgeFlow, DeepThings.
- registry.py: strategy name -> planner, and the order auto runs them in.
- stats.py: what each planner's search did (its units of work), for `edgec compile --json`.
"""
