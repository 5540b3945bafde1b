package daemon

import "github.com/runrecordd/runrecordd/internal/answers"

// The daemon answers in internal/answers' domain values: internal/server
// turns them into the API's wire types.
type (
	Summary      = answers.Summary
	Step         = answers.Step
	Parked       = answers.Parked
	Resumed      = answers.Resumed
	Signer       = answers.Signer
	Imported     = answers.Imported
	Posted       = answers.Posted
	Verification = answers.Verification
	HostInfo     = answers.HostInfo
)
