package probe

import (
	"bytes"
	"debug/elf"
	"fmt"
	"strings"
)

// Explain names the ways a probe program fails to start in an image, from
// the container's output and the run's error (nil when the container ran):
// a program that cannot start prints no verdict, and "no such file or
// directory" about a file gpupin itself mounted would send a person
// looking in the wrong place. It returns "" when the run shows none of them.
func Explain(prog Program, output []byte, runErr error) string {
	if len(prog.Args) == 0 {
		return ""
	}
	arg0 := prog.Args[0]
	text := string(output)
	if runErr != nil {
		text += "\n" + runErr.Error()
	}
	mounted := ""
	for _, m := range prog.Mounts {
		if m.Destination == arg0 {
			mounted = m.Source
		}
	}
	switch {
	case mounted != "" && execNotFound(text, arg0):
		// The file is there (gpupin mounted it): what the kernel did not
		// find is the ELF interpreter it names.
		interp := interpreter(mounted)
		if prog.Kind == CUDA {
			return fmt.Sprintf("this image has no glibc loader; the cuda probe needs glibc (%s is linked against glibc and asks for %s, "+
				"which scratch, musl and static busybox images lack; use the exec probe with a self-test of the image's own, or a glibc base)",
				CUDAProbeName, interp)
		}
		return fmt.Sprintf("the probe program %s could not start in this image: its loader %s is missing (is it the static build?)", arg0, interp)
	case prog.Kind == CUDA && strings.Contains(text, "error while loading shared libraries"):
		return "this image's glibc is incomplete for the cuda probe: " + firstLine(text, "error while loading shared libraries")
	case strings.Contains(text, "executable file not found in $PATH") || strings.Contains(text, "exec: \""+arg0+"\": stat"):
		switch prog.Kind {
		case Torch:
			return fmt.Sprintf("this image has no %s on its PATH; the torch probe needs Python with PyTorch", arg0)
		case Exec:
			return fmt.Sprintf("the image's self-test %s (its %s label) is not in the image", arg0, ExecLabel)
		}
	}
	return ""
}

// execNotFound reports whether the runtime said it could not execute path
// for want of a file (runc: "exec /path: no such file or directory").
func execNotFound(text, path string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, path) && strings.Contains(l, "no such file or directory") && strings.Contains(l, "exec") {
			return true
		}
	}
	return false
}

// interpreter returns the ELF interpreter a binary asks for, or a
// description when it cannot be read.
func interpreter(path string) string {
	f, err := elf.Open(path)
	if err != nil {
		return "its ELF interpreter"
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err == nil {
			return string(bytes.TrimRight(b, "\x00"))
		}
	}
	return "its ELF interpreter"
}

func firstLine(text, substr string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}
