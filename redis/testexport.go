package redis

import "github.com/dlock/dlock/internal/testexport/redisexport"

func init() {
	redisexport.RefreshSHA = refreshScript.Hash()
	redisexport.RefreshBatchSHA = refreshBatchScript.Hash()
	redisexport.AcquireScript = acquireScript.Script
	redisexport.ReleaseScript = releaseScript.Script
}
