"""The demos ``hpcpipe demo`` runs: ``crossover`` (the default: PPRS overtakes pipelined GD as
the pipeline deepens) and ``attack`` (GD, AGD and PPRS on the digits adversarial attack)."""
