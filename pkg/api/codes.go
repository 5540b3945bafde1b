package api

import (
	"encoding/json"
	"sync"
)

// documentedCodes are the error codes of the API's description: the Error
// schema's enum, which holds every Code* constant (the server's tests
// keep the two the same).
var documentedCodes = sync.OnceValue(func() map[string]bool {
	var doc struct {
		Components struct {
			Schemas struct {
				Error struct {
					Properties struct {
						Code struct {
							Enum []string `json:"enum"`
						} `json:"code"`
					} `json:"properties"`
				} `json:"Error"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		panic("api: openapi.json: " + err.Error())
	}
	set := make(map[string]bool)
	for _, c := range doc.Components.Schemas.Error.Properties.Code.Enum {
		set[c] = true
	}
	return set
})

// KnownCode says whether code is one of the API's error codes (the Code*
// constants), as opposed to one a newer or a hostile peer made up.
func KnownCode(code string) bool { return documentedCodes()[code] }
