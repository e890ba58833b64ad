"""Planners: each takes analysis results and an objective and returns plans; none touches ONNX.

Pipeline planners see a PipelineProblem (the chain of serial blocks priced per device) and return
PipelineSolutions; spatial planners see the LayerGraph and CostTable and return Plans with tiled stages.
The strategy registry is compiler.plan.registry.
"""
