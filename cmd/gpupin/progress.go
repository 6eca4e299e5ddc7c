package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/gpupin/gpupin/containerd"
)

// progressPrinter shows pulls: a live bar on a terminal, a line every few
// seconds otherwise (logs, CI).
type progressPrinter struct {
	w    io.Writer
	tty  bool
	mu   sync.Mutex
	last map[string]time.Time
}

func newProgressPrinter(w *os.File) *progressPrinter {
	return &progressPrinter{w: w, tty: term.IsTerminal(int(w.Fd())), last: map[string]time.Time{}}
}

func (p *progressPrinter) report(key string, pr containerd.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pct := 0.0
	if pr.Total > 0 {
		pct = 100 * float64(pr.Done) / float64(pr.Total)
	}
	if p.tty {
		const width = 30
		n := int(pct / 100 * width)
		bar := strings.Repeat("=", n) + strings.Repeat(" ", width-n)
		fmt.Fprintf(p.w, "\r%s pulling [%s] %5.1f%% %s/%s layers %d/%d", key, bar, pct, human(pr.Done), human(pr.Total), pr.LayersDone, pr.Layers)
		if pr.Finished {
			fmt.Fprintln(p.w)
		}
		return
	}
	if !pr.Finished && time.Since(p.last[key]) < 5*time.Second {
		return
	}
	p.last[key] = time.Now()
	if pr.Finished && pr.Total == 0 {
		fmt.Fprintf(p.w, "%s pulled (every layer was already in the content store)\n", key)
		return
	}
	state := "pulling"
	if pr.Finished {
		state = "pulled"
	}
	fmt.Fprintf(p.w, "%s %s %.1f%% (%s of %s, %d/%d layers)\n", key, state, pct, human(pr.Done), human(pr.Total), pr.LayersDone, pr.Layers)
}

func human(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
