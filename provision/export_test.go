package provision

// LockEngineForTest takes the engine lock as another process would.
var LockEngineForTest = lockEngine
