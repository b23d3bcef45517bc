"""The machine model: a calibrated profile (``profile``) and the measurements behind it
(``calibrate``)."""
