//go:build e2e || root

package e2e

import (
	"testing"

	"github.com/sandman-dev/sandman/e2e/framework"
)

func TestMain(m *testing.M) { framework.Main(m) }
