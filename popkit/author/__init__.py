"""New files: kernel specs, the template renderer, task folders checked."""
