package main

import (
	"bytes"
	"strings"
	"testing"
)

// The agent's help names the flag that sets how often taken pins are
// restored, and no period of its own: it once said "every 30s" whatever
// --sweep-every said.
func TestAgentHelpNamesTheSweepPeriodsFlag(t *testing.T) {
	var out bytes.Buffer
	app := newApp()
	app.Writer, app.ErrWriter = &out, &out
	if err := app.Run([]string{"gpupin", "agent", "--help"}); err != nil {
		t.Fatal(err)
	}
	help := out.String()
	if !strings.Contains(help, "restored every --sweep-every") {
		t.Errorf("help does not say the restore follows --sweep-every:\n%s", help)
	}
	if strings.Contains(help, "every 30s") {
		t.Errorf("help names a fixed period:\n%s", help)
	}
}
