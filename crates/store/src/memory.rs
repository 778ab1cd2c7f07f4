// Implemented by the memory-store work item.
