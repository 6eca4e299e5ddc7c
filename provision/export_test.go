package provision

// LockKeyForTest takes a pin key's lock as another process would.
var LockKeyForTest = lockKey
