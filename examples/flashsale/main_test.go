package main

import (
	"bytes"
	"fmt"
	"regexp"
	"testing"

	"github.com/dlock/dlock/dlocktest"
)

func TestMain(m *testing.M) { dlocktest.Main(m) }

// The sale sells exactly the stock, oversells nothing and loses no order, on
// every queue backend.
func TestFlashSale(t *testing.T) {
	backends := map[string]func(t *testing.T) string{
		"mem": func(*testing.T) string { return "mem://flashsale-test" },
		"redis": func(t *testing.T) string {
			return "redis://" + dlocktest.Require(t, dlocktest.Redis).Addr() + "/0"
		},
		"postgres": func(t *testing.T) string {
			return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", dlocktest.PostgresUser, dlocktest.PostgresPassword,
				dlocktest.Require(t, dlocktest.Postgres).Addr(), dlocktest.PostgresDatabase)
		},
	}
	for _, name := range []string{"mem", "redis", "postgres"} {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(t.Context(), []string{"-url", backends[name](t), "-buyers", "300", "-items", "10", "-workers", "4"}, &out, &errOut)
			if code != 0 {
				t.Fatalf("status %d: %s%s", code, out.String(), errOut.String())
			}
			m := regexp.MustCompile(`orders=300 items=10 sold=10 rejected=290 oversold=0 lost=0 in `).FindString(out.String())
			if m == "" {
				t.Fatalf("output %q", out.String())
			}
			t.Log(out.String())
		})
	}
}
