"""The host: this machine's facts, specgen's state folder, interrupts and RPC workers."""
