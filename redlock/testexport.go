package redlock

import "github.com/dlock/dlock/internal/testexport/redlockexport"

func init() {
	redlockexport.RefreshSHA = refreshScript.Hash()
	redlockexport.RefreshBatchSHA = refreshBatchScript.Hash()
}
