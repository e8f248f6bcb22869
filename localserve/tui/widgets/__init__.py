"""The dashboard's widgets, one module per area of the screen."""
