package pgtemp

import (
	"os/exec"
	"runtime"
	"sync"
)

// The parent-death signal (Linux's PR_SET_PDEATHSIG) fires when the thread
// that started the child exits, not the process. Go retires threads freely,
// so a server started from an ordinary goroutine could be killed in the
// middle of the tests. Every child is therefore started from one goroutine
// that holds its thread for the life of the process.
var spawner struct {
	once sync.Once
	reqs chan spawnRequest
}

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

// spawn starts cmd from the spawner thread. The caller may Wait on cmd from
// any goroutine.
func spawn(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnRequest)
		go runSpawner(spawner.reqs)
	})
	req := spawnRequest{cmd: cmd, done: make(chan error, 1)}
	spawner.reqs <- req
	return <-req.done
}

// runSpawner never returns: a goroutine that exits while locked to its
// thread takes the thread with it, and the children's death signal with it.
func runSpawner(reqs <-chan spawnRequest) {
	runtime.LockOSThread()
	for req := range reqs {
		req.done <- req.cmd.Start()
	}
}
