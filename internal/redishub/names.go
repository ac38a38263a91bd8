package redishub

import (
	"context"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// ScanNames lists, by SCAN of c, the names beginning with namePrefix whose
// keys stand on c in the layout both redis drivers share: a name's lock key
// is keyPrefix + "{name}", its waiters' key keyPrefix + "{name}" + queue. A
// name with both keys is listed twice; other keys are passed over.
func ScanNames(ctx context.Context, c goredis.UniversalClient, keyPrefix, namePrefix, queue string) ([]string, error) {
	start := keyPrefix + "{"
	iter := c.Scan(ctx, 0, globEscape(start+namePrefix)+"*", 1000).Iterator()
	var names []string
	for iter.Next(ctx) {
		k := strings.TrimPrefix(iter.Val(), start)
		if n, ok := strings.CutSuffix(k, "}"+queue); ok {
			names = append(names, n)
		} else if n, ok := strings.CutSuffix(k, "}"); ok {
			names = append(names, n)
		}
	}
	return names, iter.Err()
}
