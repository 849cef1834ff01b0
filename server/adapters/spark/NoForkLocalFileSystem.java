// tickwire: the local ("file:") filesystem for Spark checkpoints, without forked processes.
//
// Without Hadoop's native library, RawLocalFileSystem runs `chmod` for every setPermission
// (each created file and directory), `ls -ld` to read a file's permissions and owner and
// `readlink` for every link status: a process fork per checkpoint file. These classes answer
// the same calls through java.nio instead. NoForkLocalFileSystem is still a checksummed
// LocalFileSystem (Spark's RocksDB state store casts the "file:" filesystem to it);
// NoForkLocalFileSystem.Fs is the FileContext flavour (Spark's checkpoint file manager works
// through FileContext), a checksummed AbstractFileSystem over the same raw filesystem.
//
// Registered with  spark.hadoop.fs.file.impl=tickwire.hadoop.NoForkLocalFileSystem
// and              spark.hadoop.fs.AbstractFileSystem.file.impl=tickwire.hadoop.NoForkLocalFileSystem$Fs
package tickwire.hadoop;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.NoSuchFileException;
import java.nio.file.attribute.GroupPrincipal;
import java.nio.file.attribute.PosixFileAttributeView;
import java.nio.file.attribute.PosixFileAttributes;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.UserPrincipalLookupService;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class NoForkLocalFileSystem extends LocalFileSystem {

    public NoForkLocalFileSystem() {
        super(new Raw());
    }

    /** The raw (checksum-less) local filesystem with fork-free metadata calls. */
    public static class Raw extends RawLocalFileSystem {

        private static final PosixFilePermission[] BITS = {
            // index i is the bit (1 << (8 - i)) of the octal mode rwxrwxrwx
            PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_EXECUTE,
            PosixFilePermission.GROUP_READ, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_EXECUTE,
            PosixFilePermission.OTHERS_READ, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_EXECUTE,
        };

        static Set<PosixFilePermission> toPosix(short mode) {
            Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
            for (int i = 0; i < BITS.length; i++) {
                if ((mode & (1 << (8 - i))) != 0) {
                    set.add(BITS[i]);
                }
            }
            return set;
        }

        static short fromPosix(Set<PosixFilePermission> set) {
            int mode = 0;
            for (int i = 0; i < BITS.length; i++) {
                if (set.contains(BITS[i])) {
                    mode |= 1 << (8 - i);
                }
            }
            return (short) mode;
        }

        private java.nio.file.Path nio(Path p) {
            return pathToFile(p).toPath();
        }

        @Override
        public void setPermission(Path p, FsPermission permission) throws IOException {
            try {
                Files.setPosixFilePermissions(nio(p), toPosix(permission.toShort()));
            } catch (NoSuchFileException e) {
                throw new FileNotFoundException("File " + p + " does not exist");
            }
        }

        @Override
        public void setOwner(Path p, String user, String group) throws IOException {
            if (user == null && group == null) {
                throw new IOException("setOwner: user and group are both null for " + p);
            }
            PosixFileAttributeView view = Files.getFileAttributeView(nio(p), PosixFileAttributeView.class);
            UserPrincipalLookupService lookup = nio(p).getFileSystem().getUserPrincipalLookupService();
            try {
                if (user != null) {
                    view.setOwner(lookup.lookupPrincipalByName(user));
                }
                if (group != null) {
                    GroupPrincipal g = lookup.lookupPrincipalByGroupName(group);
                    view.setGroup(g);
                }
            } catch (NoSuchFileException e) {
                throw new FileNotFoundException("File " + p + " does not exist");
            }
        }

        private FileStatus status(Path f, boolean follow) throws IOException {
            java.nio.file.Path path = nio(f);
            PosixFileAttributes a;
            try {
                a = follow ? Files.readAttributes(path, PosixFileAttributes.class)
                           : Files.readAttributes(path, PosixFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
            } catch (NoSuchFileException e) {
                throw new FileNotFoundException("File " + f + " does not exist");
            }
            Path qualified = f.makeQualified(getUri(), getWorkingDirectory());
            Path target = a.isSymbolicLink() ? new Path(Files.readSymbolicLink(path).toString()) : null;
            return new FileStatus(a.isDirectory() ? 0L : a.size(), a.isDirectory(), 1, getDefaultBlockSize(f),
                    a.lastModifiedTime().toMillis(), a.lastAccessTime().toMillis(),
                    new FsPermission(fromPosix(a.permissions())), a.owner().getName(), a.group().getName(),
                    target, qualified);
        }

        @Override
        public FileStatus getFileStatus(Path f) throws IOException {
            return status(f, true);
        }

        @Override
        public FileStatus getFileLinkStatus(Path f) throws IOException {
            FileStatus st = status(f, false);
            if (st.isSymlink()) {
                Path t = st.getSymlink();
                if (!t.isAbsolute()) {
                    t = new Path(st.getPath().getParent(), t);
                }
                st.setSymlink(t.makeQualified(getUri(), getWorkingDirectory()));
            }
            return st;
        }

        @Override
        public Path getLinkTarget(Path f) throws IOException {
            java.nio.file.Path path = nio(f);
            if (!Files.isSymbolicLink(path)) {
                throw new IOException("Path " + f + " is not a symbolic link");
            }
            return new Path(Files.readSymbolicLink(path).toString());
        }

        @Override
        public FileStatus[] listStatus(Path f) throws IOException {
            java.nio.file.Path path = nio(f);
            if (!Files.isDirectory(path)) {
                return new FileStatus[] {getFileStatus(f)};
            }
            String[] names = pathToFile(f).list();
            if (names == null) {
                throw new FileNotFoundException("File " + f + " does not exist");
            }
            FileStatus[] out = new FileStatus[names.length];
            int n = 0;
            for (String name : names) {
                try {
                    out[n] = getFileStatus(new Path(f, new Path(null, null, name)));
                    n++;
                } catch (FileNotFoundException gone) {
                    // removed since the listing: skip it, as RawLocalFileSystem does
                }
            }
            return n == out.length ? out : java.util.Arrays.copyOf(out, n);
        }
    }

    /** FileContext's raw local filesystem over Raw. */
    public static class RawFs extends DelegateToFileSystem {
        public RawFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
            super(uri, new Raw(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
        }

        @Override
        public int getUriDefaultPort() {
            return -1;
        }

        @Override
        public FsServerDefaults getServerDefaults(Path f) throws IOException {
            return fsImpl.getServerDefaults(f);
        }

        @Override
        @Deprecated
        public FsServerDefaults getServerDefaults() throws IOException {
            return fsImpl.getServerDefaults();
        }

        @Override
        public boolean isValidName(String src) {
            return true;  // any local path is valid, as for Hadoop's RawLocalFs
        }
    }

    /** FileContext's checksummed local filesystem (the counterpart of Hadoop's LocalFs). */
    public static class Fs extends ChecksumFs {
        public Fs(URI uri, Configuration conf) throws IOException, URISyntaxException {
            super(new RawFs(uri, conf));
        }

        public Fs(Configuration conf) throws IOException, URISyntaxException {
            this(FsConstants.LOCAL_FS_URI, conf);
        }
    }
}
