"""Model requantization above the file level: activation statistics over calibration text
(`calibrate.py`) for the importance-weighted quantizers of edge_infer.formats."""
