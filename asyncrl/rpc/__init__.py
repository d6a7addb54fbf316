"""asyncrl.rpc: the roles' HTTP calls: bearer-token and body-limit middleware, JSON calls with deadlines, listening sockets, coalescing many one-item calls into batch calls."""
