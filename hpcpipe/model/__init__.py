"""Model pieces: layers, loss heads, depth-Δ models split into stages,
counter-based random streams and the single-process reference."""
