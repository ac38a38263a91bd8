// Package tests holds the mysql driver's tests that need a server: the
// conformance suite and the URL's server-side checks, against MariaDB
// started by dlocktest. It is a module of its own so that the driver's
// module, which applications import, does not carry the Docker harness.
package tests
