"""Problems: what is minimised (layers per stage, loss head, variable,
projection, regulariser, metrics and known constants)."""
