"""Migration planning after the kernel: the plan's suppliers, bytes and ids (plan), and its schedule (schedule)."""
