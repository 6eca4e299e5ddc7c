package run_test

import (
	"testing"

	"github.com/gpupin/gpupin/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
