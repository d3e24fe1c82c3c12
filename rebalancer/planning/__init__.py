"""Migration planning: planner, scheduler and cost model, partition versions and stamps."""
