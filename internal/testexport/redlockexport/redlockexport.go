// Package redlockexport holds package redlock's unexported values for the
// tests module; package redlock sets them at init (see ../doc.go).
package redlockexport

// RefreshSHA and RefreshBatchSHA tell the watchdog's script calls apart.
var RefreshSHA, RefreshBatchSHA string
