package member

import (
	"os"
	"testing"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
)

// The tests share one etcd cluster (etcdtest.Shared), each under a prefix
// of its own: it is closed here, after every test.
func TestMain(m *testing.M) {
	code := m.Run()
	etcdtest.CloseShared()
	os.Exit(code)
}
