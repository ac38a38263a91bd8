package postgres

// Internals for the tests of package postgres_test.
var (
	FastUnlock        = fastUnlock
	OIDAdvisoryUnlock = oidAdvisoryUnlock
)
