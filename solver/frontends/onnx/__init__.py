"""The one ONNX reader: loading without weights, constant folding, shapes, FLOPs, the cost graph."""
