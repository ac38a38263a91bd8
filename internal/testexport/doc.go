// Package testexport is the root of the packages that hand dlock's own server
// tests (the tests module, github.com/dlock/dlock/tests) what each driver keeps
// unexported: the hooks and values that a driver's export_test.go gave tests in
// its own module. Each driver fills its package's variables from an init
// function in its file testexport.go; nothing but the tests reads them, and
// nothing outside this repository can import them (they are internal).
package testexport
