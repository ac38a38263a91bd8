module github.com/dlock/dlock/mysql

go 1.26.0

require (
	github.com/dlock/dlock v1.0.0-rc.0
	github.com/go-sql-driver/mysql v1.10.1
)

require filippo.io/edwards25519 v1.2.0 // indirect
