package dlock

import "github.com/dlock/dlock/driver"

// Capabilities is what a backend declares about itself: fencing tokens, FIFO
// waiting, notified waiting, its minimum TTL, whether locks survive a server
// restart, how long past ValidUntil it may keep a lost holder's lock
// (ExpirySlack), and whether a lock lives only as long as its connection.
// Locker.Capabilities returns it; see driver.Capabilities for each field.
type Capabilities = driver.Capabilities
